"""The test suite, by feature; tests/README.md says where a new test goes."""
