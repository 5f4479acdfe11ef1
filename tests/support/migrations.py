"""Moving the test database's schema for migration tests, and back.

Migrating one app backwards unapplies every migration of any app that depends on the ones it leaves (the
moderation app depends on buzz's), so the way back is to the leaf of every app, never of one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def migrate_to_leaves() -> None:
    """Every app to its latest migration: the schema the rest of the suite expects."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@contextlib.contextmanager
def schema_at(targets: list[tuple[str, str]]) -> Iterator[None]:
    """The schema at `targets` for the block, then every app back at its leaf."""
    migrate(targets)
    try:
        yield
    finally:
        migrate_to_leaves()
