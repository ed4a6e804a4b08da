"""Pydantic schemas: one canonical form for checkpoint facts, capabilities and the policy document."""
