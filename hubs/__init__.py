"""Hubs: where a stage gets its API documents and its examples, one class per kind (APIBench, tool
set, catalog) that owns what differs between kinds; stages never test a hub's kind
(docs/development.md says where a new kind goes)."""

from ratune.hubs.base import (HUB_KINDS, Hub, as_hub_source, check_hub_ref, hub_argument_type, hub_choices_text,
                              hub_name, manifest_hub_record, recorded_hub_kind, register_hub_kind, resolve_hub)
from ratune.hubs.apibench import APIBENCH, APIBENCH_DATASET_ID, APIBenchHub
from ratune.hubs.tools import TOOL_SET_LAYOUT, ToolSetHub  # before catalogs, which claim any folder
from ratune.hubs.catalog import CATALOG, CATALOG_LAYOUT, CatalogHub

__all__ = ["APIBENCH", "APIBENCH_DATASET_ID", "APIBenchHub", "CATALOG", "CATALOG_LAYOUT", "CatalogHub", "HUB_KINDS",
           "Hub", "TOOL_SET_LAYOUT", "ToolSetHub", "as_hub_source", "check_hub_ref", "hub_argument_type", "hub_choices_text", "hub_name",
           "manifest_hub_record", "recorded_hub_kind", "register_hub_kind", "resolve_hub"]
