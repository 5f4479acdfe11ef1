"""buzz.dev: the embedded PostgreSQL and Redis the suite and make run use."""
