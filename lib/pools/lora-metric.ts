/**
 * The `max_lora` label of vLLM's `vllm:lora_requests_info` gauge. Each sample's value is the
 * time it was last set, and every adapter set seen lingers as its own series: the newest
 * series (largest value) is the engine's current state. `undefined` when the page has none.
 */
export function readMaxLora(text: string): number | undefined {
  let newest = -Infinity;
  let maxLora: number | undefined;
  let start = text.indexOf('vllm:lora_requests_info{');
  while (start !== -1) {
    let end = text.indexOf('\n', start);
    if (end === -1) end = text.length;
    const line = text.slice(start, end);
    const label = /[{,]\s*max_lora="(\d{1,6})"/.exec(line);
    const value = Number(/\}\s*(\S+)/.exec(line)?.[1]);
    if (label !== null && Number.isFinite(value) && value > newest) {
      newest = value;
      maxLora = Number(label[1]);
    }
    start = text.indexOf('\nvllm:lora_requests_info{', end - 1);
    if (start !== -1) start++;
  }
  return maxLora === undefined || maxLora < 1 ? undefined : maxLora;
}
