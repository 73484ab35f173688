"""Every import scripts/setup.sh promises, each used once, so that a broken environment (a
torchvision beside a torch it was not built for, a missing module) fails setup loudly instead of
the first script a user brings.

    python scripts/check_environment.py [--tests]
"""

import sys


def main() -> None:
    import numpy
    import torch

    import zerowait

    print(f"zerowait {zerowait.__version__}, torch {torch.__version__}, numpy {numpy.__version__}")
    assert float(torch.ones(2) @ torch.ones(2)) == 2.0
    if "--tests" in sys.argv[1:]:
        import pytest
        import ray.data
        import torchvision
        from torchvision.ops import nms
        from torchvision.transforms import v2

        assert nms(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([1.0]), 0.5).tolist() == [0]
        crop = v2.RandomResizedCrop(8)(torch.zeros(3, 16, 16, dtype=torch.uint8))
        assert tuple(crop.shape) == (3, 8, 8)
        print(f"torchvision {torchvision.__version__}, pytest {pytest.__version__}, "
              f"ray {ray.__version__}")


if __name__ == "__main__":
    main()
