"""What this machine is and what it can build: GPUs, driver, Jetson board and importable backend modules.

``machineprobe.probe_machine()`` gathers the facts (``gpus``: NVML or nvidia-smi; ``jetson``; ``modules``: the
importable backends), ``policy.buildable_targets()`` turns them into the targets (and so the Celery queues) this
worker serves, ``report.probe_report()`` explains the decision in words and ``machineprobe.machine_fingerprint()``
gives the same machine as a deploy-time ``Machine``.

Nothing here needs a GPU: without NVML, or with a backend whose native libraries fail to load,
the probe records why and carries on. pynvml and the backend modules are imported lazily.
"""
