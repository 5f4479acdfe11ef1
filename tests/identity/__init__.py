"""buzz.identity: settings that fail closed, API tokens, authentication."""
