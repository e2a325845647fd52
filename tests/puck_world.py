"""The puck world's scenes as the tests draw them: a built-in preset's parameters and its scenes."""

from __future__ import annotations

import numpy as np

from qhlab.scenes import load_preset
from qhlab.scenes.puck.draw import PuckParameters, draw_scene, scene_generator
from qhlab.scenes.puck.world import Scene
from qhlab.scenes.sampler import scene_seed


def puck_parameters(preset: str = "tiny", **options) -> PuckParameters:
    """The puck parameters of a built-in preset, with ``options`` replacing some of its options."""
    return PuckParameters.from_options({**load_preset(preset).environment.options, **options})


def draw(parameters: PuckParameters, split: str, seed: int, index: int) -> tuple[Scene, np.ndarray]:
    """Scene ``index`` of the population ``(split, seed)``: its table and initial positions ``[n, 2]``."""
    return draw_scene(scene_generator(scene_seed(split, seed, index)), parameters)
