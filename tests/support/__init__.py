"""Helpers shared by the test folders: one home (import as ``tests.support.<module>``)."""
