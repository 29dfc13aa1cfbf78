// A process's side of chaos testing: the kill points the launcher gave it (FERRY_CHAOS, as JSON),
// checked call by call. At one, the process asks the launcher to kill it and waits: the kill lands
// while the call is in progress. The launcher kills each point once; asked again (a replayed call,
// a restarted process), it answers `spare`.
import { request, type Bus } from '../mesh/wire/index.ts';
import { ChaosSpare, PROTOCOL_VERSION } from '../mesh/wire/index.ts';
import type { Subjects } from '../mesh/wire/index.ts';
import { reachedBySupervisor, reachedByWorker, type KillPoint } from '../engine/supervision/index.ts';

export const CHAOS_ENV = 'FERRY_CHAOS';

export class ChaosClient {
  private readonly spared = new Set<string>();

  constructor(
    private readonly nc: Bus,
    private readonly subj: Subjects,
    private readonly points: readonly KillPoint[],
    private readonly log: (line: string) => void,
  ) {}

  static fromEnv(nc: Bus, subj: Subjects, log: (line: string) => void): ChaosClient | undefined {
    const text = process.env[CHAOS_ENV];
    if (!text) return undefined;
    let points: KillPoint[];
    try {
      points = JSON.parse(text) as KillPoint[];
    } catch (e) {
      throw new Error(`${CHAOS_ENV}: expected a JSON list of kill points, got ${text.slice(0, 80)}: ${(e as Error).message}`);
    }
    return points.length ? new ChaosClient(nc, subj, points, log) : undefined;
  }

  /** Asks about every kill point reached here, in order, until one is carried out (or none is). */
  async workerCall(device: number, model: string, fn: string, iteration: number): Promise<void> {
    for (const k of this.points.filter((p) => !this.spared.has(p.id) && reachedByWorker(p, device, model, fn, iteration))) {
      await this.ask(k, `device ${device}, '${fn}' of ${model}, iteration ${iteration}`);
    }
  }

  async supervisorCall(fn: string, iteration: number): Promise<void> {
    for (const k of this.points.filter((p) => !this.spared.has(p.id) && reachedBySupervisor(p, fn, iteration))) {
      await this.ask(k, `the supervisor sending '${fn}', iteration ${iteration}`);
    }
  }

  private async ask(k: KillPoint, where: string): Promise<void> {
    this.log(`chaos: reached kill point ${k.id} (${where}); asking to be ${k.how === 'hang' ? 'hung' : 'killed'}`);
    try {
      await request(this.nc, this.subj.chaos, { type: 'chaos', v: PROTOCOL_VERSION, target: k.id, pid: process.pid, where }, ChaosSpare, 10_000);
      this.log(`chaos: kill point ${k.id} was done before; spared`);
    } catch (e) {
      this.log(`chaos: no answer about kill point ${k.id} (${(e as Error).message}); going on`);
    }
    this.spared.add(k.id);
  }
}
