"""vllm-fleet: drive the vllm_fleet.fleet playbooks from CI (the ``vllm-fleet`` command)."""

__version__ = "0.1.0"
