"""Version helpers: cuDNN's integer encoding and PEP 440 parsing with a named culprit."""

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.versions import (
    cudnn_int_to_version,
    parse_version,
    release_string,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (92400, "9.24.0"),
        (91900, "9.19.0"),
        (92301, "9.23.1"),
        (90000, "9.0.0"),
        (100203, "10.2.3"),
        (8907, "8.9.7"),  # cuDNN 8 encoded MAJOR*1000; torch built against it says so
    ],
)
def test_cudnn_int_to_version(value, expected):
    assert cudnn_int_to_version(value) == expected


@pytest.mark.parametrize("value", [0, -92400, True, "92400", 9.24, None])
def test_cudnn_int_to_version_rejects_what_cudnn_never_returns(value):
    with pytest.raises(ValueError, match="cuDNN version number"):
        cudnn_int_to_version(value)


def test_parse_version_orders_numerically():
    assert parse_version("9.9.0", "cudnn") < parse_version("9.19.0.56", "cudnn") < parse_version("9.24.0.43", "cudnn")


def test_parse_version_names_what_and_text():
    with pytest.raises(ValueError, match=r"^nvidia-cudnn-cu13 version: 'nine' is not a version"):
        parse_version("nine", "nvidia-cudnn-cu13 version")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9.24.0.43", "9.24.0"),
        ("9.24", "9.24.0"),
        ("9", "9.0.0"),
        (" 9.19.0.56 ", "9.19.0"),
        ("2.11.0+cu130", "2.11.0"),
    ],
)
def test_release_string(text, expected):
    assert release_string(text, "x") == expected


def test_release_string_other_lengths():
    assert release_string("9.24.0.43", "x", parts=2) == "9.24"
