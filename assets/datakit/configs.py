"""The DataKit assets' configs, generated from the library's knobs (one declaration each:
marin_assets/knobs.py). `marin datakit run`'s flags come from the same declarations."""

from __future__ import annotations

from marin_assets.datakit.chat import ChatConfig
from marin_assets.datakit.decontaminate import DecontamConfig
from marin_assets.datakit.eval_sets import EvalSetsConfig
from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig
from marin_assets.datakit.language import LanguageConfig
from marin_assets.datakit.quality import QualityModelConfig, QualityScoreConfig
from marin_assets.datakit.readers import ReaderConfig
from marin_assets.datakit.shard_index import ShardingConfig
from marin_assets.datakit.sources import SourceConfig
from marin_assets.datakit.tokenize import TokenizeConfig
from marin_assets.orchestration.knob_configs import stage_config


class SourceAssetConfig(stage_config("SourceAssetConfig", (SourceConfig, ["docs_per_shard"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class QualityModelAssetConfig(stage_config("QualityModelAssetConfig", (QualityModelConfig, ["holdout_fraction"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class EvalNgramConfig(
    stage_config("EvalNgramConfig", (EvalSetsConfig, ["eval_sets"]), (DecontamConfig, ["false_positive_rate"]))
):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class ShardIndexConfig(stage_config("ShardIndexConfig", (ShardingConfig, ["shard_bytes"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class ShardNormalizeConfig(stage_config("ShardNormalizeConfig", (ReaderConfig, ["max_doc_bytes", "extractor"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class LanguageAssetConfig(stage_config("LanguageAssetConfig", (LanguageConfig, ["languages"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class QualityConfig(stage_config("QualityConfig", (QualityScoreConfig, ["threshold"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class DecontamAssetConfig(stage_config("DecontamAssetConfig", (DecontamConfig, ["threshold"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class TokenizedConfig(
    stage_config("TokenizedConfig", (TokenizeConfig, ["validation_fraction", "min_validation_docs", "batch_docs"]))
):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class FuzzyConfig(stage_config("FuzzyConfig", (FuzzyDedupConfig, ["jaccard_threshold"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class CandidatesConfig(stage_config("CandidatesConfig", (FuzzyDedupConfig, ["docs_per_reduce"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""


class ChatDatasetConfig(stage_config("ChatDatasetConfig", (ChatConfig, ["turns"]))):
    """Knobs of the library configs named here (marin_assets/knobs.py)."""
