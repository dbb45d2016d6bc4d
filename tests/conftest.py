import os

import torch

# Without a GPU, the Triton kernels are tested through Triton's interpreter on CPU tensors.
# It must be chosen before roiops.triton (and so triton.jit) is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
