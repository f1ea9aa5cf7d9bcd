"""The ImageNet segmentation benchmark file of Chefer et al. 2021 (after Guillaumin et al.): ``gtsegs_ijcv.mat``,
4,276 ImageNet images with object masks, a MATLAB v7.3 file, so HDF5 (read with h5py).

Layout: ``/value/img`` ``[N, 1]`` references, each to a ``[3, W, H]`` uint8 image (MATLAB's column-major order);
``/value/gt`` ``[N, 1]`` references, each to a ``[1, 1]`` array of references to a ``[W, H]`` mask (non-zero =
object). The benchmark scores a method's maps with
:func:`vitscope.functional.explanation_scores.segmentation_scores`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitscope.data.formats.common import DatasetFileNotFoundError, DatasetFormatError

__all__ = ["ImagenetSegmentation"]


class ImagenetSegmentation:
    """``gtsegs_ijcv.mat`` as a sequence of ``(image [H, W, 3] uint8, mask [H, W] bool)``, read on access.

    Args:
        path: the ``.mat`` file.

    Raises:
        DatasetFileNotFoundError: no such file.
        DatasetFormatError: not an HDF5 file with ``/value/img`` and ``/value/gt`` of one length.
    """

    def __init__(self, path: str | Path) -> None:
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise DatasetFileNotFoundError(f"{self.path} not found (the ImageNet segmentation file gtsegs_ijcv.mat)")
        try:
            with h5py.File(self.path, "r") as f:
                images, masks = f.get("/value/img"), f.get("/value/gt")
                if images is None or masks is None:
                    raise DatasetFormatError(f"{self.path} has no /value/img and /value/gt: not gtsegs_ijcv.mat")
                if len(images) != len(masks):
                    raise DatasetFormatError(f"{self.path}: {len(images)} images but {len(masks)} masks")
                self._length = len(images)
        except OSError as err:
            raise DatasetFormatError(f"{self.path} is not an HDF5 (MATLAB v7.3) file: {err}") from None
        self._file: Any = None

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        import h5py

        if not -self._length <= index < self._length:
            raise IndexError(f"{self.path.name}: index {index} out of range for {self._length} images")
        if self._file is None:  # opened on first access, in the process that reads (DataLoader workers included)
            self._file = h5py.File(self.path, "r")
        f, i = self._file, index % self._length
        image = np.asarray(f[f["/value/img"][i, 0]]).transpose(2, 1, 0)
        mask = np.asarray(f[f[f["/value/gt"][i, 0]][0, 0]]).transpose(1, 0)
        if image.ndim != 3 or image.shape[-1] != 3 or mask.shape != image.shape[:2]:
            raise DatasetFormatError(f"{self.path.name} item {i}: image {image.shape} and mask {mask.shape} do not "
                                     "fit (expected [H, W, 3] and [H, W])")
        return image.astype(np.uint8), mask != 0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None}  # an open HDF5 handle does not travel to another process
