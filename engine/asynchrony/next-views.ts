// Weights to the rollout devices as versions, while they keep generating. Iteration t generates
// (ahead, under a lag) with a view that holds version t; once its training has made version t + 1,
// that version is moved into a second copy of the view on the same devices, beside the generation
// still running on the first (the calls are marked `beside`: engine/device/beside.ts), and
// iteration t + 1 takes it over: the generation switches version between its batches, and the move
// is off the path from one generation to the next. The two copies alternate names by the
// version's parity, so a version's copy never meets the one before it.

/** A view held on its devices, until released. */
export interface Releasable {
  release(): Promise<void>;
}

interface Prepared<V> {
  version: number;
  /** The dispatcher's epoch it was filled in: a recovery drops every view, so another epoch's is gone. */
  epoch: number;
  /** The plan it was filled for: a re-plan moves the generation elsewhere. */
  plan: object;
  view: Promise<V>;
}

/** Which of the two copies of a call's view holds `version`: 0 (the view's own name) or 1. */
export const copyOf = (version: number): 0 | 1 => (version % 2) as 0 | 1;

/** The next version's views, being filled or filled, by the call that generates with them. */
export class NextViews<V extends Releasable> {
  private readonly prepared = new Map<string, Prepared<V>>();

  /**
   * Starts filling `call`'s view with `version` (`hold` loads and fills it, beside what runs).
   * A view prepared before and never taken is released first.
   */
  prepare(call: string, version: number, epoch: number, plan: object, hold: () => Promise<V>): Promise<V> {
    const old = this.prepared.get(call);
    if (old) void this.drop(old);
    const view = hold();
    // Awaited by whoever takes it; until then a failure must not go unhandled.
    view.catch(() => {});
    this.prepared.set(call, { version, epoch, plan, view });
    return view;
  }

  /**
   * The view of `call` holding `version`, filled in this epoch for this plan, if one was
   * prepared: `view`, the caller's from then on (to release). Another prepared for `call` is
   * released where its own epoch still can; one of an earlier epoch (whose calls its dispatcher
   * refuses now) comes back as `stale`, for the caller to release on the plan it was filled for
   * (a device reset since has dropped it already; one that was not, as when a re-plan keeps the
   * plan, still holds it).
   */
  take(call: string, version: number, epoch: number, plan: object): { view?: Promise<V>; stale?: { view: Promise<V>; plan: object } } {
    const p = this.prepared.get(call);
    if (!p) return {};
    this.prepared.delete(call);
    if (p.version === version && p.epoch === epoch && p.plan === plan) return { view: p.view };
    if (p.epoch === epoch) {
      void this.drop(p);
      return {};
    }
    return { stale: { view: p.view, plan: p.plan } };
  }

  /** Releases every view prepared and not taken (a run that ends, or changes plan). */
  async clear(): Promise<void> {
    const all = [...this.prepared.values()];
    this.prepared.clear();
    await Promise.all(all.map((p) => this.drop(p)));
  }

  get size(): number {
    return this.prepared.size;
  }

  private async drop(p: Prepared<V>): Promise<void> {
    await p.view.then((v) => v.release()).catch(() => {});
  }
}
