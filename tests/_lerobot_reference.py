"""Run by a Python with lerobot installed (not this suite's): write a small dataset with LeRobot's
own writer, then save what ``LeRobotDataset(...)[i]`` gives for every ``i`` to an ``.npz``.

    python tests/_lerobot_reference.py OUT_DIR CODEC [CODEC ...]

For each codec (``h264``, ``libsvtav1``: LeRobot's default), ``OUT_DIR/<codec>/`` holds the
dataset: two cameras, three episodes of 7, 5 and 9 timesteps one after another in one file per
camera; and ``OUT_DIR/<codec>.npz`` the items, key ``<case>|<field>`` stacked over ``i``, for the
cases of ``CASES`` (``plain``: no windows; ``windows``: windows that pass both edges of every
episode; ``episodes``: episodes 0 and 2 alone, with windows). A frame is saved as LeRobot gives it
(float32 ``[(T,) 3, H, W]`` in [0, 1]); ``task`` as its text.
"""

import sys

import numpy as np

FPS = 10
SIZE = (48, 64)
LENGTHS = (7, 5, 9)
CAMERAS = ("observation.images.front", "observation.images.wrist")
WINDOWS = {"observation.images.front": [-0.2, -0.1, 0.0], "observation.state": [-0.1, 0.0],
           "action": [0.0, 0.1, 0.2, 0.3]}
CASES = {"plain": ({}, None), "windows": (WINDOWS, None), "episodes": (WINDOWS, [0, 2])}


def image(camera: int, step: int, frame: int) -> np.ndarray:
    """A frame that tells its camera and timestep apart from every other (colours by camera and
    timestep, a bar as long as its place in the episode) over a gradient and a checkerboard, so
    that the decoders' colour conversion and chroma upsampling are compared on edges and slopes."""
    h, w = SIZE
    y, x = np.mgrid[:h, :w]
    img = np.zeros((h, w, 3), np.int64)
    img[..., 0] = 40 + 60 * camera + x
    img[..., 1] = (step * 23) % 150 + 30 + y
    img[..., 2] = 60 * (((y // 4) + (x // 4)) % 2)
    img[: h // 2, : 6 * (frame + 1), 2] = 220
    return img.clip(0, 255).astype(np.uint8)


def write(root: str, codec: str) -> None:
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    h, w = SIZE
    features = {c: {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]} for c in CAMERAS}
    features["observation.state"] = {"dtype": "float32", "shape": (4,), "names": None}
    features["action"] = {"dtype": "float32", "shape": (3,), "names": None}
    ds = LeRobotDataset.create("shmloader/reference", fps=FPS, features=features, root=root,
                               rgb_encoder=RGBEncoderConfig(vcodec=codec))
    rng = np.random.default_rng(0)
    step = 0
    for e, n in enumerate(LENGTHS):
        for f in range(n):
            frame = {c: image(j, step, f) for j, c in enumerate(CAMERAS)}
            frame.update({"observation.state": rng.standard_normal(4).astype(np.float32),
                          "action": rng.standard_normal(3).astype(np.float32), "task": f"task {e % 2}"})
            ds.add_frame(frame)
            step += 1
        ds.save_episode()
    ds.finalize()


def dump(root: str, out: str) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    saved = {}
    for case, (windows, episodes) in CASES.items():
        ds = LeRobotDataset("shmloader/reference", root=root, delta_timestamps=windows or None, episodes=episodes)
        items = [ds[i] for i in range(len(ds))]
        for key in items[0]:
            values = [it[key] for it in items]
            saved[f"{case}|{key}"] = np.asarray(values) if key == "task" else np.stack([v.numpy() for v in values])
    saved["backend"] = np.asarray(ds._video_backend)  # torchcodec where it loads, else PyAV
    np.savez(out, **saved)


if __name__ == "__main__":
    folder, codecs = sys.argv[1], sys.argv[2:]
    for codec in codecs:
        write(f"{folder}/{codec}", codec)
        dump(f"{folder}/{codec}", f"{folder}/{codec}.npz")
