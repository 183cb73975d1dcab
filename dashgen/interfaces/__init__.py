"""dashgen where users already call attention: SDPA's layout and flash backend
(interfaces.sdpa), FlashAttention's function signatures (interfaces.flash_attn). Each entry
point runs dashgen.attention and refuses, with an error naming the argument, what it cannot do.
"""
