"""Test helpers that ship with the package (as optuna.testing does): shared harnesses and contracts."""
