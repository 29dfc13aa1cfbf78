// The bytes a sender frames its chunks into, reused. A chunk of a megabyte framed into a new array
// costs a fresh megabyte a chunk — zeroed, faulted in, and collected — on top of the copy the
// client makes when it writes it out; a frame the bus no longer reads can take the next chunk.
//
// The bus no longer reads a frame once the server has answered a flush sent after it: the client
// copies what it publishes into its outbound buffer before it writes that out, and a flush is
// answered only after everything before it was written. So a frame goes back to the pool with the
// flush that follows it (see `pacer` in transfer.ts), and never sooner.

/** Frames smaller than this are not kept: a small chunk's fresh array costs little. */
const SMALLEST_KEPT = 64 << 10;

export class FramePool {
  private readonly free: Uint8Array[] = [];
  /** Frames made, and frames taken from the pool instead: what the pool saved. */
  made = 0;
  reused = 0;

  /** `keep`: frames the pool holds at most while no sender needs them. */
  constructor(private readonly keep: number) {}

  /**
   * At least `size` bytes for one frame, with anything in them (the frame writes every byte it
   * uses): the smallest free frame that fits, or a new one.
   */
  readonly take = (size: number): Uint8Array => {
    let best = -1;
    this.free.forEach((f, i) => {
      if (f.length >= size && (best < 0 || f.length < this.free[best]!.length)) best = i;
    });
    if (best >= 0) {
      this.reused += 1;
      return this.free.splice(best, 1)[0]!;
    }
    this.made += 1;
    return Buffer.allocUnsafeSlow(size);
  };

  /** Frames the bus no longer reads (whole or the part a message used): each may be taken again. */
  give(frames: readonly Uint8Array[]): void {
    for (const f of frames) {
      const whole = new Uint8Array(f.buffer, 0, f.buffer.byteLength);
      if (f.byteOffset === 0 && whole.length >= SMALLEST_KEPT && this.free.length < this.keep) this.free.push(whole);
    }
  }

  /** Frames held free now. */
  get size(): number {
    return this.free.length;
  }
}
