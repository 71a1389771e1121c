"""The demo project: a small shop that sends its orders through the outbox."""
