"""Fixtures for the models tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from models_helpers import make_model  # noqa: E402


@pytest.fixture
def tiny_model():
    return make_model()
