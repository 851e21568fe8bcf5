"""served_names: what clients may ask a profile for (the rename check of preflight)."""
import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import served_names
from tests.fixtures.story import FP8, NVFP4, SERVED


def test_the_shipped_profiles_serve_one_name_across_quantizations():
    assert served_names(FP8) == served_names(NVFP4) == [SERVED]


@pytest.mark.parametrize("serve_args, expected", [
    ({"served-model-name": "qwen"}, ["qwen"]),
    ({"served_model_name": ["qwen", "qwen-nvfp4"]}, ["qwen", "qwen-nvfp4"]),
    ({"--served-model-name": ["qwen"]}, ["qwen"]),
    ({}, ["/models/q"]),  # vLLM's default: the model as given
])
def test_every_spelling_and_the_default(serve_args, expected):
    assert served_names({"name": "p", "model": "/models/q", "serve_args": serve_args}) == expected


def test_a_node_that_serves_nothing_has_no_names():
    assert served_names({}) == [] and served_names(None) == []


def test_not_a_profile_is_named():
    with pytest.raises(ValueError, match="is not a profile"):
        served_names(["qwen"])
