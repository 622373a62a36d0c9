// The README's usage example, type-checked against lib/index.d.ts by
// `npm run typecheck` (js/ci.sh): the declarations must describe the API
// the way a TypeScript trainer uses it.
import { createClipper, CLIP_STATE_WGSL, clipStateLayoutEntry, GradclipError, type Reports } from "gradclip";

export async function example(backward: (grads: GPUBuffer) => GPUCommandBuffer): Promise<Reports> {
  const clipper = await createClipper();
  const device: GPUDevice = clipper.device; // run your own pipelines on it
  const grads = await clipper.createGradients({ named: { "fc1.weight": 784 * 128, "fc1.bias": 128 } });
  device.queue.submit([backward(grads.buffer)]); // your WGSL writes the gradients
  const step: number = grads.clipNorm({ maxNorm: 1.0, norm: 2, semantics: "torch" });
  const optimizer = device.createShaderModule({ code: CLIP_STATE_WGSL + "/* your optimizer */" });
  void [step, optimizer, clipStateLayoutEntry(3), grads.coefficientBinding];
  try {
    grads.clipNorm({ maxNorm: -1 });
  } catch (e) {
    if (e instanceof GradclipError && e.code === "INVALID_MAX_NORM") console.log(e.message);
  }
  const polled: Reports = grads.pollReports(); // never waits
  void polled.reports.map((r) => r.totalNorm);
  return grads.reports();
}
