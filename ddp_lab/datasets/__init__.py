"""Datasets ddp_lab ships, each a callable returning (train, test) Datasets of
(input, target) pairs, named by a data preset's `_target_` (conf/data/):

    images.py  fashion_mnist (data=fashion_mnist), synthetic_images (data=synthetic)
    text.py    text_corpus (data=text): bytes of plain text for a language model;
               text_documents (data=text_documents): its documents as Hugging Face-style dicts
    pairs.py   TensorPairs: a dataset held as two tensors, batched on the device
    keyed.py   KeyedPairs: dict samples (Hugging Face's) as pairs, by data.input_key and data.target_key;
               TensorDicts and collate: dict samples given to the model whole, by keyword
    fashion_mnist_files.py  Fashion-MNIST's four files: found, checked, unpacked once, read
"""
from ddp_lab.datasets.images import fashion_mnist, synthetic_images
from ddp_lab.datasets.pairs import ScaledPixels, TensorPairs, as_tensor_pairs
from ddp_lab.datasets.text import text_corpus

__all__ = ["ScaledPixels", "TensorPairs", "as_tensor_pairs", "fashion_mnist", "synthetic_images", "text_corpus"]
