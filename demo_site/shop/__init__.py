"""The demo shop: orders placed here are sent to a webhook through the outbox."""
