"""The kernel: the farm's domain types and rules, shared by the client, the API, the worker and the catalog.

Targets and task states (``domain``), build specs and their hash (``spec``), shapes (``shapes``), the machine
fingerprint (``machine``), compatibility rules and choosing an engine (``compat``, ``choose``), settings
(``config``), the error tree (``errors``), validation, bundles and hashing, the machine probe (``probe``), and the
small pieces the processes share (worker ids, scratch locks, statistics, trtexec's syntax). It imports nothing else
of the project and no server package (tests/e2e/test_layout.py).
"""
