"""The farm's processes: its commands, the embedded launcher, the demo, and the services for tests."""
