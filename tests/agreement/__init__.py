"""The embedded store and the Lua scripts, played the same random sequences side by side
(``python -m tests.agreement``; a fixed seed in tests/test_store_agreement.py)."""
