"""Helpers for the test suite: the session environment, relay processes, a WebSocket client."""
