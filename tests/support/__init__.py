"""Shared test harness, no tests: the session environment, relay processes, a WebSocket client, factories,
relay round trips (wire), database checks (records), in-process services with round-trip counting."""
