"""Running artifacts where targets run them: ai-edge-litert and TFLM (litert),
LiteRT's GPU accelerator in a child (gpu_worker), LiteRT.js in headless
Chromium (browser); targets taking turns on the cores while they wait on a
child (overlap), and latency measured the same way on both sides (measure).
Nothing here judges an output: that is verdict's job."""
