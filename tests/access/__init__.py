"""buzz.access.policy: decisions on hand-built facts, the permission matrix on a real relay, non-disclosure."""
