"""Formats: one plug-in point (`Format`), and a lazy registry of formats by name
(`formats.registry`: built-ins, `register_format`, and installed plug-ins' entry points)."""

from __future__ import annotations

from .base import Format, FormatPlan, Listing, ReadOptions
from .registry import ENTRY_POINT_GROUP, available_formats, get_format, register_format

__all__ = [
    "ENTRY_POINT_GROUP",
    "Format",
    "FormatPlan",
    "Listing",
    "ReadOptions",
    "available_formats",
    "get_format",
    "register_format",
]
