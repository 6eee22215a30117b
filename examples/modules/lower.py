#!/usr/bin/env python3
"""Inverse half of the `upper` example: ASCII upper case back to lower case.

A demo: the pair round-trips text without capitals exactly.
"""
from ndd_module import serve

serve(lambda payload: payload.lower())
