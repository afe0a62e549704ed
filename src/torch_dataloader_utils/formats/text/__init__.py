"""CSV and JSON Lines: what both share (`format.TextFormat`, `options`), and each one's
records and parsing (`csv.CsvFormat`, `json.JsonFormat`)."""

from __future__ import annotations

from .csv import CsvFormat
from .json import JsonFormat

__all__ = ["CsvFormat", "JsonFormat"]
