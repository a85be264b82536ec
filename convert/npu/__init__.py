"""android-npu: LiteRT ahead-of-time compile for phone NPUs, checked on Qualcomm's HTP simulator."""
