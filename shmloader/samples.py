"""Synthetic sample videos whose frames encode their video id and frame number (see ``video.samples``)."""

from .video.samples import frame_image, make_videos, read_codes, write_video

__all__ = ["frame_image", "make_videos", "read_codes", "write_video"]
