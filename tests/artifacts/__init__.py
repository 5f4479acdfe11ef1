"""artifacts: the NIP-AR envelope, the write path (HTTP, races, idempotency, replay, stateful), the views;
the executable spec models (artifact_model, query_model) beside the tests that use them."""
