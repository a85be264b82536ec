"""The precision variants a target asks for, derived from the one float export:
ai-edge-quantizer's float16 / dynamic / static int8 (quantize), the flatbuffer
rewrites every static int8 variant gets (tflite_rewrites), and the int8 forms
of ops TFLM cannot run otherwise (tflm_int8)."""
