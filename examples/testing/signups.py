"""A small app for the testing guide (docs/testing.md): one queue of welcome mails.

A mail to an address without ``@`` can never be sent (``PermanentError``: dead letter at
once); while the mail service is down, sending fails and the job is retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import BaseModel

from streamq import App, Backoff, Job, JobDefaults, PermanentError, QueueContract, job


class Signup(BaseModel):
    user_id: str
    email: str


class Welcome(
    QueueContract,
    name="welcome",
    defaults=JobDefaults(attempts=3, backoff=Backoff.fixed(timedelta(milliseconds=20))),
):
    send = job("send", Signup)


@dataclass
class Mailer:
    """Stands in for a mail service: ``down_for`` calls fail, then it delivers."""

    sent: list[str] = field(default_factory=list)
    down_for: int = 0

    def deliver(self, address: str) -> None:
        if self.down_for > 0:
            self.down_for -= 1
            raise ConnectionError("mail service unavailable")
        self.sent.append(address)


app = App([Welcome], state=Mailer())


@app.processor(Welcome, concurrency=4)
def send_welcome(job: Job[Signup]) -> None:
    if "@" not in job.payload.email:
        raise PermanentError(f"user {job.payload.user_id} has no valid address")
    app.state.deliver(job.payload.email)
