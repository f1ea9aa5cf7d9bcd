"""Training recipes of the tiny zoo, reusable on your own models and images.

* :class:`SupervisedRecipe` (cross-entropy), :class:`SelfDistillRecipe` (DINO-style), :class:`MAERecipe`
  (masked autoencoder), :class:`MetricRecipe` (Proxy-Anchor / ArcFace with SGD one-cycle);
* :func:`fit` runs any of them with progress bars and resumable checkpoints;
* :func:`train_embedding` puts a metric-learning head on any backbone and trains it on an ImageFolder.
"""

from vitscope.train.data import TensorImages, image_folder_tensors, synthetic_split
from vitscope.train.embedding import EmbeddingNet, train_embedding
from vitscope.train.loop import LoopConfig, Recipe, TrainResult, fit
from vitscope.train.mae import MAEConfig, MAERecipe
from vitscope.train.metric import MetricConfig, MetricRecipe
from vitscope.train.self_distill import SelfDistillConfig, SelfDistillRecipe
from vitscope.train.supervised import SupervisedConfig, SupervisedRecipe

__all__ = ["EmbeddingNet", "LoopConfig", "MAEConfig", "MAERecipe", "MetricConfig", "MetricRecipe", "Recipe",
           "SelfDistillConfig", "SelfDistillRecipe", "SupervisedConfig", "SupervisedRecipe", "TensorImages",
           "TrainResult", "fit", "image_folder_tensors", "synthetic_split", "train_embedding"]
