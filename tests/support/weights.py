"""A model's weights as one digest: did a weight update change them, or leave them alone?"""

from __future__ import annotations

import hashlib
from typing import Any


def weights_digest(model: Any) -> str:
    digest = hashlib.sha256()
    for _, tensor in sorted(model.state_dict().items()):
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()
