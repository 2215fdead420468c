"""One registry per concept: methods (`methods.py`, the cards in `card.py`, the built-in ones in
`orchestrator/methods/*/card.py`) and datasets (`datasets.py`, built-in cards there, others through
`register_dataset` or a class folder).

Plain data, importable without torch, so the results layer and the dashboard read it cheaply.
"""

from orchestrator.registry.datasets import (
                                            CROSS_DOMAIN,
                                            DATASETS,
                                            OOD,
                                            DatasetCard,
                                            canonical_dataset,
                                            dataset_card,
                                            dataset_key,
                                            dataset_title,
                                            ensure_dataset,
                                            group_datasets,
                                            paper_datasets,
                                            register_dataset,
)
from orchestrator.registry.methods import (
                                            HParam,
                                            MethodCard,
                                            baseline_method,
                                            find_method,
                                            hparam_docs,
                                            hparam_is_log,
                                            hparam_kinds,
                                            load_plugins,
                                            method_card,
                                            method_cards,
                                            method_label,
                                            method_names,
                                            method_rank,
                                            register_method,
)

__all__ = [
    "CROSS_DOMAIN", "DATASETS", "OOD", "DatasetCard", "HParam", "MethodCard", "baseline_method", "canonical_dataset",
    "dataset_card", "dataset_key", "dataset_title", "ensure_dataset", "find_method", "group_datasets", "hparam_docs", "hparam_is_log", "hparam_kinds",
    "load_plugins", "method_card", "method_cards", "method_label", "method_names", "method_rank", "paper_datasets",
    "register_dataset", "register_method",
]
