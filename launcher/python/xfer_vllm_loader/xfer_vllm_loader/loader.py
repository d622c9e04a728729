"""The ``xfer`` load format: vLLM's default safetensors loader, fed one shard
at a time as this node's xfer agent verifies them (``agent.arrivals``).

The shards are the files the model's ``model.safetensors.index.json`` names
(or the single ``model.safetensors``); the index and config are small files
the launcher already waited for. Each name is checked before it is waited
for, and its file again once the agent vouches for it and before it is opened
(``agent.check_shard_name``: a plain relative path resolving inside the model
folder, or a Hub snapshot's repo folder). Each shard goes through vLLM's own
``safetensors_weights_iterator`` alone, so nothing opens a shard before the
agent vouches for it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from vllm.logger import init_logger
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.weight_utils import (
    safetensors_weights_iterator,
)

from .agent import LoaderError, Settings, arrivals, check_shard_name

logger = init_logger("vllm.xfer_loader")


def named_by(folder: str) -> str:
    """The file that names the shards of the model in ``folder``: its
    index, else the single shard file itself."""
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.exists(index):
        return index
    return os.path.join(folder, SAFE_WEIGHTS_NAME)


def shard_names(folder: str) -> list[str]:
    """The safetensors shards of the model in ``folder``, from its index
    (the small file the launcher waited for), else the single file; each
    a checked, normalized path inside the folder (``check_shard_name``)."""
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        names = sorted(
            {check_shard_name(folder, n, index) for n in weight_map.values()}
        )
        if not names:
            raise LoaderError(
                f"xfer loader: {index} names no shard; the model is not a "
                "sharded safetensors checkpoint"
            )
        return names
    return [check_shard_name(folder, SAFE_WEIGHTS_NAME, named_by(folder))]


class XferModelLoader(DefaultModelLoader):
    """Loads local safetensors shards in the order the agent verifies them."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.settings = Settings.from_env()

    def _folder(self, source: "DefaultModelLoader.Source") -> str:
        folder = source.model_or_path
        if not os.path.isdir(folder):
            raise LoaderError(
                f"xfer loader: {folder} is not a folder on this node; the "
                "`xfer` load format loads a model xfer delivers, by its path"
            )
        if source.subfolder:
            folder = os.path.join(folder, source.subfolder)
        return folder

    def download_model(self, model_config) -> None:
        # Nothing to download: the agent delivers, the load waits for it.
        pass

    def _get_weights_iterator(
        self, source: "DefaultModelLoader.Source"
    ) -> Generator[tuple[str, torch.Tensor], None, None]:
        folder = self._folder(source)
        shards = shard_names(folder)
        index = named_by(folder)

        def log(line: str) -> None:
            logger.info("%s", line)

        def weights():
            for name in arrivals(shards, self.settings, log=log):
                # Again now that the file is there: where its links lead.
                name = check_shard_name(folder, name, index)
                yield from safetensors_weights_iterator(
                    [os.path.join(folder, name)],
                    self.load_config.use_tqdm_on_load,
                    self.load_config.safetensors_load_strategy,
                    local_expert_ids=self.local_expert_ids,
                )

        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        return ((source.prefix + n, t) for (n, t) in weights())
