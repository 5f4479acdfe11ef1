"""The Django admin pages."""
