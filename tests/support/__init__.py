"""Helpers shared by test modules (no tests here): import them as tests.support.<module>."""
