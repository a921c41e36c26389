"""Drafting methods: one file per kind of drafter, one registry, one spelling (`name[:key=value,...]`)."""
from .base import Method, MethodError, MethodSpec, Param
from .env import Env
from .hf import MethodUnavailable, Output
from .registry import REGISTRY, bind, canonical, parse, parse_list, split_list

__all__ = ["Method", "MethodError", "MethodSpec", "Param", "Env", "MethodUnavailable", "Output", "REGISTRY",
           "canonical", "parse", "parse_list", "split_list"]
