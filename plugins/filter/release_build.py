# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)
"""Filters of the vllm_runtime role: judge a staged release and describe it.

Each is a thin wrapper over plugins/module_utils/releases.py (plain Python, unit-tested
there); their documentation is in the sidecar YAML files next to this one.
"""

from ansible.errors import AnsibleFilterError


def _releases():
    # Imported when a filter runs: to find one filter, Ansible imports (and compiles, collections
    # have no .pyc) every filter file of the collection in each worker.
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils import releases

    return releases


def _wrap(func):
    def filter_(*args, **kwargs):
        releases = _releases()
        try:
            return func(*args, **kwargs)
        except releases.ReleaseError as exc:
            raise AnsibleFilterError(str(exc)) from None

    filter_.__name__ = func.__name__
    filter_.__doc__ = func.__doc__
    return filter_


def release_check(result, release):
    return _releases().judge_check(result, release)


def release_cudnn_verdict(facts, release):
    return _releases().judge_cudnn(facts, release)


def release_resolve_failure(result, release, source):
    return _releases().resolve_failure(result, release, source)


def release_manifest(lock_text, release, check, cudnn_facts, cudnn_required_by, tools, source, created):
    return _releases().build_manifest(
        release=release, lock_text=lock_text, check=check, cudnn_facts=cudnn_facts,
        cudnn_required_by=cudnn_required_by, tools=tools, source=source, created=created,
    )


class FilterModule:
    def filters(self):
        return {
            f.__name__: _wrap(f)
            for f in (release_check, release_cudnn_verdict, release_resolve_failure, release_manifest)
        }
