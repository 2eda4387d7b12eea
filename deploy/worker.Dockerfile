# The example worker: streamq with its metrics, tracing and OTLP extras, and the example app.
FROM python:3.12-slim

WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app

COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip install --no-cache-dir ".[hiredis,metrics,tracing,otlp]"
COPY examples ./examples

EXPOSE 9100
CMD ["python", "-m", "worker"]
