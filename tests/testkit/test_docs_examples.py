"""The testing guide's example suite (examples/testing) runs as the guide says, on the fake
and on a real redis-server."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamq.testing import find_binary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "testing"


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_the_testing_guide_example_passes(pytester: pytest.Pytester, kind: str) -> None:
    if kind == "real" and find_binary() is None:
        pytest.skip("no redis-server")
    for name in ("signups.py", "test_signups.py"):
        (pytester.path / name).write_text((EXAMPLE / name).read_text())
    result = pytester.runpytest_subprocess(f"--streamq-redis={kind}", "-p", "no:cacheprovider",
                                           "-rE")
    if kind == "fake":
        # The memory-limit test refuses to run on the fake, saying why.
        result.assert_outcomes(passed=4, errors=1)
        result.stdout.fnmatch_lines(["*needs a real redis-server; fakeredis cannot do: "
                                     "memory_limits*"])
    else:
        result.assert_outcomes(passed=5)
