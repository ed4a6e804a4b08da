"""Adapters that carry a policy into serving engines (entry points; nothing in moepolicy imports them)."""
