// report.html: one self-contained page (inline CSS and SVG, no script, nothing fetched) that shows
// a run: its summary, the plan drawn over the devices, the measured timeline of every device beside
// the planner's estimate, the training curves, and the chaos the run went through. Each section
// carries data-items, the number of things it drew, so that a browser test can tell an empty
// section from a rendered one.
import type { EpisodeRecordWire, Metrics } from '../../../mesh/wire/index.ts';
import type { Simulation } from '../plan/simulate.ts';
import type { Summary } from './record.ts';
import type { CallName, Placed } from '../scenario/scenario.ts';
import { parseMesh } from '../../../mesh/parallel/index.ts';

/** One call as recorded in timeline.jsonl (ms since the epoch). */
export interface CallRecord {
  type: 'call';
  device: number;
  model: string;
  fn: string;
  iteration: number;
  sent: number;
  device_ms: number;
  replied: number;
  ok: boolean;
  /** The collective group, which names the algorithm's call when the call was one of its graph's. */
  group?: string;
}

/** The graph's call a recorded call was part of (`actor.generate_greedy`), if it was one. */
export function graphCallOf(c: Pick<CallRecord, 'group'>): string | undefined {
  return c.group?.match(/-\[([^\]]+)\]-\d+$/)?.[1];
}

export interface RecoveryRecord {
  type: 'recovery';
  start: number;
  end: number;
  reason: string;
  epoch: number;
}

export interface KillRecord {
  at: number;
  actor: string;
  call: string;
  iteration: number;
  how: string;
  where: string;
  recovery_seconds?: number;
}

/** A chaos event of the scenario that never fired (chaos.json's `unfired`): which, what it was to do, why not, and whether the scenario lets it be skipped. */
export interface UnfiredRecord {
  event: string;
  expected: string;
  why: string;
  optional: boolean;
}

/** A call's placement, as the scenario's plan has it. */
export type PlanRow = Placed;

export interface ReportInput {
  title: string;
  plan: PlanRow[];
  devices: number;
  devicesPerNode: number;
  summary?: Summary;
  metrics?: Metrics[];
  calls?: CallRecord[];
  recoveries?: RecoveryRecord[];
  kills?: KillRecord[];
  unfired?: UnfiredRecord[];
  /** A few episodes per iteration (episodes.jsonl), for a run with an environment. */
  episodes?: Array<{ iteration: number; episodes: EpisodeRecordWire[] }>;
  estimate?: { simulation: Simulation; iterationSeconds: number; profile: string } | { missing: string };
}

export type Kind = 'generation' | 'inference' | 'training' | 'reallocation' | 'checkpoint' | 'other';

export const KIND_COLORS: Record<Kind | 'waiting' | 'recovery', string> = {
  generation: '#4e79a7',
  inference: '#59a14f',
  training: '#e15759',
  reallocation: '#f28e2b',
  checkpoint: '#b07aa1',
  other: '#9c9c9c',
  waiting: '#eeeeee',
  recovery: 'rgba(214, 39, 40, 0.22)',
};

export function kindOf(fn: string): Kind {
  if (fn === 'generate') return 'generation';
  if (fn === 'inference') return 'inference';
  if (fn === 'train' || fn === 'sft' || fn === 'preference') return 'training';
  if (fn === 'realloc') return 'reallocation';
  if (fn === 'checkpoint' || fn === 'restore') return 'checkpoint';
  return 'other';
}

/** What each call of the dataflow is, for its colour. */
const CALL_KINDS: Record<CallName, Kind> = {
  'actor.generate': 'generation',
  'actor.train': 'training',
  'critic.inference': 'inference',
  'critic.train': 'training',
  'reference.inference': 'inference',
  'reward.inference': 'inference',
};

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
const fmt = (x: number | null | undefined, d = 3) => (x === null || x === undefined || !Number.isFinite(x) ? 'n/a' : x.toFixed(d));

interface Bar {
  row: number;
  start: number;
  end: number;
  color: string;
  title: string;
  /** A call that failed or was abandoned: drawn as an outline. */
  failed?: boolean;
}

/** Rows of bars over a time axis (seconds), with optional bands across every row and markers. */
function timelineSvg(rows: string[], bars: Bar[], opts: { bands?: Bar[]; marks?: Array<{ at: number; title: string }>; width?: number } = {}): string {
  const width = opts.width ?? 1100;
  const left = 90;
  const rowH = 22;
  const top = 16;
  const end = Math.max(1e-9, ...bars.map((b) => b.end), ...(opts.bands ?? []).map((b) => b.end), ...(opts.marks ?? []).map((m) => m.at));
  const x = (t: number) => left + ((width - left - 10) * t) / end;
  const height = top + rows.length * rowH + 24;
  const parts: string[] = [];
  rows.forEach((label, i) => {
    const y = top + i * rowH;
    parts.push(`<text x="4" y="${y + 15}" class="lbl">${esc(label)}</text>`);
    parts.push(`<rect x="${left}" y="${y + 2}" width="${width - left - 10}" height="${rowH - 4}" fill="${KIND_COLORS.waiting}"><title>waiting</title></rect>`);
  });
  for (const b of bars) {
    const w = Math.max(0.5, x(b.end) - x(b.start));
    const paint = b.failed ? `fill="none" stroke="${b.color}" stroke-dasharray="3,2"` : `fill="${b.color}"`;
    parts.push(
      `<rect class="span${b.failed ? ' failed' : ''}" x="${x(b.start).toFixed(2)}" y="${top + b.row * rowH + 2}" width="${w.toFixed(2)}" height="${rowH - 4}" ${paint}><title>${esc(b.title)}</title></rect>`,
    );
  }
  for (const b of opts.bands ?? []) {
    parts.push(
      `<rect class="band" x="${x(b.start).toFixed(2)}" y="${top}" width="${Math.max(1, x(b.end) - x(b.start)).toFixed(2)}" height="${rows.length * rowH}" fill="${b.color}"><title>${esc(b.title)}</title></rect>`,
    );
  }
  for (const m of opts.marks ?? []) {
    const mx = x(m.at).toFixed(2);
    parts.push(
      `<g class="mark"><line x1="${mx}" x2="${mx}" y1="${top - 4}" y2="${top + rows.length * rowH}" stroke="#d62728" stroke-dasharray="3,2"/><path d="M${mx},${top} l-5,-9 h10 z" fill="#d62728"/><title>${esc(m.title)}</title></g>`,
    );
  }
  const ticks = 8;
  for (let k = 0; k < ticks; k++) {
    const t = (end * k) / ticks;
    parts.push(`<text x="${x(t).toFixed(1)}" y="${height - 6}" class="tick">${t.toFixed(t < 10 ? 2 : 1)} s</text>`);
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${parts.join('')}</svg>`;
}

function legend(kinds: Array<keyof typeof KIND_COLORS>): string {
  return `<p class="legend">${kinds.map((k) => `<span><i style="background:${KIND_COLORS[k]}"></i>${k}</span>`).join(' ')}</p>`;
}

/** A line chart of one or more series over iterations. */
function chartSvg(title: string, series: Array<{ name: string; color: string; values: Array<number | undefined> }>): { svg: string; points: number } {
  const w = 520;
  const h = 200;
  const pad = { l: 48, r: 10, t: 22, b: 24 };
  const all = series.flatMap((s) => s.values.filter((v): v is number => v !== undefined && Number.isFinite(v)));
  const n = Math.max(...series.map((s) => s.values.length), 1);
  const lo = all.length ? Math.min(...all) : 0;
  const hi = all.length ? Math.max(...all) : 1;
  const span = hi - lo || 1;
  const x = (i: number) => pad.l + ((w - pad.l - pad.r) * i) / Math.max(1, n - 1);
  const y = (v: number) => h - pad.b - ((h - pad.t - pad.b) * (v - lo)) / span;
  let points = 0;
  const lines = series.map((s) => {
    const pts = s.values.map((v, i) => (v === undefined || !Number.isFinite(v) ? undefined : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter((p): p is string => p !== undefined);
    points += pts.length;
    return `<polyline class="series" fill="none" stroke="${s.color}" stroke-width="1.8" points="${pts.join(' ')}"><title>${esc(s.name)}</title></polyline>`;
  });
  const names = series.map((s, i) => `<text x="${pad.l + 6 + i * 120}" y="14" class="lbl" fill="${s.color}">${esc(s.name)}</text>`).join('');
  const axis =
    `<line x1="${pad.l}" y1="${h - pad.b}" x2="${w - pad.r}" y2="${h - pad.b}" stroke="#999"/><line x1="${pad.l}" y1="${pad.t}" x2="${pad.l}" y2="${h - pad.b}" stroke="#999"/>` +
    `<text x="4" y="${pad.t + 8}" class="tick">${fmt(hi, 3)}</text><text x="4" y="${h - pad.b}" class="tick">${fmt(lo, 3)}</text>` +
    `<text x="${pad.l}" y="${h - 6}" class="tick">iteration 0</text><text x="${w - pad.r - 70}" y="${h - 6}" class="tick">iteration ${n - 1}</text>`;
  return { svg: `<figure><figcaption>${esc(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}">${axis}${names}${lines.join('')}</svg></figure>`, points };
}

/** A plan drawn over the devices: a row per call, a column per device; `lost` devices shaded. */
function planSvg(plan: PlanRow[], devices: number, devicesPerNode: number, lost: readonly number[] = []): string {
  const r = { plan, devices, devicesPerNode };
  const cols = r.devices;
  const cw = Math.max(28, Math.min(70, Math.floor(900 / Math.max(1, cols))));
  const left = 150;
  const rowH = 26;
  const width = left + cols * cw + 10;
  const height = 30 + r.plan.length * rowH;
  const parts: string[] = [];
  for (let d = 0; d < cols; d++) {
    const node = Math.floor(d / r.devicesPerNode);
    if (d % r.devicesPerNode === 0)
      parts.push(
        `<rect x="${left + d * cw}" y="2" width="${r.devicesPerNode * cw - 2}" height="${height - 4}" fill="${node % 2 ? '#f7f7f7' : '#fbfbfb'}" stroke="#ddd"/><text x="${left + d * cw + 3}" y="13" class="tick">node ${node}</text>`,
      );
    if (cols <= 64) parts.push(`<text x="${left + d * cw + 3}" y="26" class="tick">${d}</text>`);
    if (lost.includes(d)) parts.push(`<rect x="${left + d * cw + 1}" y="30" width="${cw - 3}" height="${height - 34}" fill="rgba(214, 39, 40, 0.15)"><title>device ${d}: lost for good</title></rect>`);
  }
  r.plan.forEach((p, i) => {
    const y = 30 + i * rowH;
    parts.push(`<text x="4" y="${y + 17}" class="lbl">${esc(p.call)}</text>`);
    for (const d of p.devices) {
      parts.push(
        `<rect class="cell" x="${left + d * cw + 1}" y="${y + 3}" width="${cw - 3}" height="${rowH - 6}" fill="${KIND_COLORS[CALL_KINDS[p.call]]}"><title>${esc(`${p.call} on device ${d}: mesh ${p.mesh}, dp ${p.dp} tp ${p.tp} pp ${p.pp}`)}</title></rect>`,
      );
    }
    const first = Math.min(...p.devices);
    parts.push(`<text x="${left + first * cw + 4}" y="${y + 17}" class="cellt">dp${p.dp} tp${p.tp} pp${p.pp}</text>`);
  });
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}">${parts.join('')}</svg>`;
}

function planSection(r: ReportInput): string {
  const rows = r.plan.map((p) => `<tr><td>${esc(p.call)}</td><td>${esc(p.mesh)}</td><td>${p.devices.length}</td><td>${p.dp}</td><td>${p.tp}</td><td>${p.pp}</td></tr>`).join('');
  return (
    `<section id="plan" data-items="${r.plan.length}"><h2>Plan</h2><p>Which devices run each call, and with which data (dp), tensor (tp) and pipeline (pp) parallelism${r.summary?.replans?.length ? ' (at the start: the run re-planned, see below)' : ''}.</p>` +
    planSvg(r.plan, r.devices, r.devicesPerNode) +
    `<table><tr><th>call</th><th>mesh</th><th>devices</th><th>dp</th><th>tp</th><th>pp</th></tr>${rows}</table></section>`
  );
}

function measuredSection(r: ReportInput): string {
  const calls = r.calls ?? [];
  if (calls.length === 0) return `<section id="timeline" data-items="0"><h2>Measured timeline</h2><p>No calls were recorded (timeline.jsonl is missing or empty).</p></section>`;
  const t0 = Math.min(...calls.map((c) => c.sent), ...(r.recoveries ?? []).map((x) => x.start), ...(r.kills ?? []).map((k) => k.at));
  const devices = [...new Set(calls.map((c) => c.device))].sort((a, b) => a - b);
  const rowOf = new Map(devices.map((d, i) => [d, i]));
  const bars: Bar[] = calls.map((c) => {
    const kind = kindOf(c.fn);
    const startMs = c.device_ms > 0 ? c.replied - c.device_ms : c.sent;
    return {
      row: rowOf.get(c.device)!,
      start: (startMs - t0) / 1000,
      end: (c.replied - t0) / 1000,
      color: KIND_COLORS[kind],
      failed: !c.ok,
      title: `${graphCallOf(c) ? `${graphCallOf(c)}: ` : ''}${c.fn} of ${c.model}, iteration ${c.iteration}, device ${c.device}: ${(c.device_ms / 1000).toFixed(3)} s on the device, ${((c.replied - c.sent) / 1000).toFixed(3)} s round trip${c.ok ? '' : ' (failed)'}`,
    };
  });
  // With an environment: its time beside each generation of episodes, on a row of its own.
  const envOf = new Map((r.metrics ?? []).filter((m) => typeof m.env_seconds === 'number').map((m) => [m.iteration, m]));
  const envBars: Bar[] = envOf.size
    ? calls
        .filter((c) => c.fn === 'generate' && c.ok && envOf.has(c.iteration))
        .map((c) => {
          const m = envOf.get(c.iteration)!;
          const startMs = c.device_ms > 0 ? c.replied - c.device_ms : c.sent;
          return {
            row: devices.length,
            start: (startMs - t0) / 1000,
            end: (c.replied - t0) / 1000,
            color: ENV_COLOR,
            title: `environment, iteration ${c.iteration}: ${fmt(m.env_seconds as number, 2)} s answering (summed over requests), the generating device idle ${fmt(100 * (m.device_idle as number), 1)}% of the call, ${fmt(m.turns as number, 2)} turns per episode`,
          };
        })
    : [];
  bars.push(...envBars);
  const bands: Bar[] = (r.recoveries ?? []).map((x) => ({ row: 0, start: (x.start - t0) / 1000, end: (x.end - t0) / 1000, color: KIND_COLORS.recovery, title: `recovery ${x.epoch}: ${x.reason}` }));
  const marks = (r.kills ?? []).map((k) => ({ at: (k.at - t0) / 1000, title: `chaos: ${k.how} ${k.actor} in ${k.where}` }));
  const svg = timelineSvg([...devices.map((d) => `device ${d}`), ...(envBars.length ? ['environment'] : [])], bars, { bands, marks });
  return (
    `<section id="timeline" data-items="${bars.length}"><h2>Measured timeline</h2>` +
    `<p>Every call each device ran, from its own clock (the bus and queueing are the rest of each round trip). Grey: waiting. Dashed outlines: calls that failed or were abandoned. Red bands: recoveries; red markers: kills.</p>` +
    legend(['generation', 'inference', 'training', 'reallocation', 'checkpoint', 'other', 'waiting', 'recovery']) +
    (envBars.length ? `<p>The environment row: each generation of episodes, while the environment answered (hover for its seconds and the device's idle share).</p>` : '') +
    svg +
    `</section>`
  );
}

function estimateSection(r: ReportInput, measuredIteration?: number | null): string {
  const e = r.estimate;
  if (!e || 'missing' in e) return `<section id="estimate" data-items="0"><h2>Estimated timeline</h2><p>${esc(e && 'missing' in e ? e.missing : 'No estimate.')}</p></section>`;
  const tl = e.simulation.timeline;
  const devices = [...new Set(tl.map((t) => t.device))].sort((a, b) => a - b);
  const rowOf = new Map(devices.map((d, i) => [d, i]));
  const bars: Bar[] = tl.map((t) => ({
    row: rowOf.get(t.device)!,
    start: t.start,
    end: t.end,
    color: t.kind === 'realloc' ? KIND_COLORS.reallocation : KIND_COLORS[CALL_KINDS[t.call]],
    title: `${t.call}${t.kind === 'realloc' ? ' (reallocation)' : ''}, iteration ${t.iteration}, device ${t.device}: ${(t.end - t.start).toFixed(4)} s estimated`,
  }));
  const rows = devices.length > 64 ? devices.filter((_, i) => i % Math.ceil(devices.length / 64) === 0) : devices;
  const shown = new Set(rows);
  const svg = timelineSvg(
    rows.map((d) => `device ${d}`),
    bars.filter((b) => shown.has(devices[b.row]!)).map((b) => ({ ...b, row: rows.indexOf(devices[b.row]!) })),
  );
  return (
    `<section id="estimate" data-items="${bars.length}"><h2>Estimated timeline</h2>` +
    `<p>The planner's simulation of this plan (profile: ${esc(e.profile)}): ${fmt(e.iterationSeconds, 3)} s per iteration${measuredIteration ? `, against ${fmt(measuredIteration, 3)} s measured (median)` : ''}.${rows.length < devices.length ? ` Every ${Math.ceil(devices.length / 64)}th device is drawn.` : ''}</p>` +
    legend(['generation', 'inference', 'training', 'reallocation', 'waiting']) +
    svg +
    `</section>`
  );
}

function curvesSection(r: ReportInput): string {
  const m = r.metrics ?? [];
  if (m.length === 0) return `<section id="curves" data-items="0"><h2>Training curves</h2><p>No iterations were recorded.</p></section>`;
  const charts = [
    chartSvg('reward', [
      { name: 'reward', color: '#4e79a7', values: m.map((x) => x.reward_mean) },
      ...(m.some((x) => x.rule_score !== undefined) ? [{ name: 'rule score', color: '#59a14f', values: m.map((x) => x.rule_score) }] : []),
    ]),
    ...statCharts(m),
    chartSvg('tokens per second', [{ name: 'tokens/s', color: '#76b7b2', values: m.map((x) => x.tokens_per_second) }]),
  ];
  return `<section id="curves" data-items="${charts.reduce((n, c) => n + c.points, 0)}"><h2>Training curves</h2><div class="charts">${charts.map((c) => c.svg).join('')}</div></section>`;
}

/** Statistics every algorithm records, drawn elsewhere or not curves. */
const COMMON = new Set(['iteration', 'reward_mean', 'seconds', 'tokens', 'tokens_per_second', 'realloc_seconds', 'realloc_bytes', 'rule_score', 'rewards']);
const PALETTE = ['#e15759', '#b07aa1', '#f28e2b', '#edc948', '#9c755f', '#ff9da7', '#bab0ac'];

/**
 * The algorithm's own statistics, as it recorded them: its losses in one chart, its clip fractions
 * in another, every other statistic in its own. Only what the run has is drawn (no critic loss for GRPO).
 */
function statCharts(m: ReadonlyArray<Record<string, unknown>>): Array<ReturnType<typeof chartSvg>> {
  const names = [...new Set(m.flatMap((x) => Object.keys(x)))].filter((k) => !COMMON.has(k) && m.some((x) => typeof x[k] === 'number'));
  const series = (k: string, i: number) => ({ name: k.replaceAll('_', ' '), color: PALETTE[i % PALETTE.length]!, values: m.map((x) => (typeof x[k] === 'number' ? (x[k] as number) : undefined)) });
  const losses = names.filter((k) => k.endsWith('_loss'));
  const clips = names.filter((k) => k.endsWith('_clipfrac'));
  const others = names.filter((k) => !k.endsWith('_loss') && !k.endsWith('_clipfrac'));
  return [
    ...(losses.length ? [chartSvg('losses', losses.map(series))] : []),
    ...(clips.length
      ? [
          chartSvg(
            'clip fractions',
            clips.map((k, i) => series(k, i + losses.length)),
          ),
        ]
      : []),
    ...others.map((k, i) => chartSvg(k === 'kl' ? 'KL to the reference' : k.replaceAll('_', ' '), [series(k, i + losses.length + clips.length)])),
  ];
}

function chaosSection(r: ReportInput): string {
  const kills = r.kills ?? [];
  const recoveries = r.recoveries ?? [];
  const unfired = r.unfired ?? [];
  const items = kills.length + recoveries.length + unfired.length;
  const unfiredRows = unfired.map((u) => `<tr><td>${esc(u.event)}</td><td>${esc(u.expected)}</td><td>${esc(u.why)}</td><td>${u.optional ? 'yes' : 'no'}</td></tr>`).join('');
  const killRows = kills
    .map((k) => `<tr><td>${esc(k.how)}</td><td>${esc(k.actor)}</td><td>${esc(k.call)}</td><td>${k.iteration}</td><td>${esc(k.where)}</td><td>${fmt(k.recovery_seconds, 2)}</td></tr>`)
    .join('');
  const recRows = recoveries.map((x) => `<tr><td>${x.epoch}</td><td>${esc(x.reason)}</td><td>${fmt((x.end - x.start) / 1000, 2)}</td></tr>`).join('');
  return (
    `<section id="chaos" data-items="${items}"><h2>Chaos and recovery</h2>` +
    (items === 0 ? '<p>No kills and no recoveries in this run.</p>' : '') +
    (kills.length ? `<h3>Kills</h3><table><tr><th>how</th><th>actor</th><th>call</th><th>iteration</th><th>where</th><th>recovered in (s)</th></tr>${killRows}</table>` : '') +
    (unfired.length
      ? `<h3>Events that never fired</h3><p>The scenario's chaos events that did not happen: one not optional fails <code>npm run chaos</code>.</p><table><tr><th>event</th><th>expected</th><th>why not</th><th>optional</th></tr>${unfiredRows}</table>`
      : '') +
    (recoveries.length ? `<h3>Recoveries</h3><table><tr><th>epoch</th><th>cause</th><th>seconds</th></tr>${recRows}</table>` : '') +
    `</section>`
  );
}

const ENV_COLOR = '#76b7b2';

/** A few episodes of the first and last iterations, as transcripts: the policy's actions and the environment's observations told apart. */
function episodesSection(r: ReportInput): string {
  const its = r.episodes ?? [];
  if (its.length === 0) return '';
  const shown = its.length > 1 ? [its[0]!, its.at(-1)!] : [its[0]!];
  let items = 0;
  const tables = shown.map(({ iteration, episodes }) => {
    const rows = episodes.map((e) => {
      items += 1;
      const turns = e.turns
        .map(
          (t, i) => `<div><b>${i + 1}</b> <span class="act">${esc(t.text || '∅')}</span> → <span class="obs">${esc(t.observation || '∅')}</span>${t.reward ? ` <i>${fmt(t.reward, 2)}</i>` : ''}</div>`,
        )
        .join('');
      return `<tr><td>${esc(e.id)}</td><td><span class="obs">${esc(e.reset.observation || '∅')}</span></td><td>${turns}</td><td>${fmt(e.return, 2)}</td><td>${esc(e.end)}</td></tr>`;
    });
    return `<h3>Iteration ${iteration}</h3><table><tr><th>episode</th><th>reset</th><th>turns: <span class="act">action</span> → <span class="obs">observation</span> (reward)</th><th>return</th><th>end</th></tr>${rows.join('')}</table>`;
  });
  return `<section id="episodes" data-items="${items}"><h2>Episodes</h2><p>A few episodes of the first and last iterations (episodes.jsonl has them for every iteration).</p>${tables.join('')}</section>`;
}

function summarySection(r: ReportInput): string {
  const s = r.summary;
  if (!s) return `<section id="summary" data-items="0"><h2>Summary</h2><p>No summary.json: the run did not finish.</p></section>`;
  const rows: Array<[string, string]> = [
    ['status', s.status + (s.error ? `: ${s.error}` : '')],
    ['scenario', s.scenario],
    ['run', s.run],
    ['iterations', String(s.iterations)],
    ['backend', s.backend],
    ['wall time', `${fmt(s.wall_seconds, 1)} s`],
    ['tokens per second (median)', fmt(s.tokens_per_second, 1)],
    ['reward, first 5 iterations → last 5', `${fmt(s.reward_first5)} → ${fmt(s.reward_last5)}`],
    ['recoveries', String(s.recoveries?.length ?? 0)],
    ...(s.rollouts ? ([['rollouts (prompts, lost, trained twice)', `${s.rollouts.prompts}, ${s.rollouts.lost}, ${s.rollouts.duplicated}`]] as Array<[string, string]>) : []),
    ...(s.warmup
      ? ([
          [
            'warm-up (steps, loss first → last)',
            `${s.warmup.steps}, ${fmt(s.warmup.first_loss, 3)} → ${fmt(s.warmup.loss, 3)}${s.warmup.source === 'environment' ? ` (the environment's expert, ${fmt(s.warmup.turns ?? 0, 2)} actions per demonstration)` : ''}`,
          ],
        ] as Array<[string, string]>)
      : []),
    ...(s.reward_model ? ([['reward model (pairs, accuracy)', `${s.reward_model.pairs}, ${fmt(s.reward_model.accuracy, 3)}`]] as Array<[string, string]>) : []),
    ...Object.entries(s.digests).map(([k, v]) => [`${k} digest`, v] as [string, string]),
  ];
  return `<section id="summary" data-items="${rows.length}"><h2>Summary</h2><table>${rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join('')}</table></section>`;
}

const STYLE = `body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:13px}th{background:#f5f5f5}
.lbl{font-size:12px}.tick{font-size:10px;fill:#555}.cellt{font-size:10px;fill:#fff}.legend span{margin-right:12px;font-size:12px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}figcaption{font-size:13px;font-weight:600}
.act{font-family:monospace;color:#1f4e99;background:#eaf1fb}.obs{font-family:monospace;color:#555;background:#f1f1f1}`;

/** An elastic run's re-plans: why, what the search and the migration took, the periods estimated and measured, the plan before and after. */
function replansSection(r: ReportInput): string {
  const replans = r.summary?.replans ?? [];
  if (!replans.length) return '';
  const cluster = { nodes: Math.max(1, Math.round(r.devices / r.devicesPerNode)), devicesPerNode: r.devicesPerNode };
  const rows = (p: Record<string, { mesh: string; dp: number; tp: number; pp: number }>): PlanRow[] =>
    Object.entries(p).map(([call, q]) => ({ call, ...q, devices: parseMesh(q.mesh, cluster).devices }));
  let lostBy: number[] = [];
  const parts = replans.map((x, i) => {
    // A device lost earlier whose worker joined again is the run's again (used or idle).
    const before = lostBy.filter((d) => !x.joined.includes(d));
    lostBy = [...before, ...x.lost];
    const figures: Array<[string, string]> = [
      ['why', x.why],
      ['search', `${fmt(x.search_seconds, 2)} s, ${x.plans_evaluated} plans evaluated`],
      ['period (s per iteration)', `estimated ${fmt(x.estimated_period_before, 3)} before, ${fmt(x.estimated_period_after, 3)} after; measured after: ${fmt(x.measured_period_after, 3)}`],
      ...(x.machine_speed === undefined
        ? []
        : ([['priced at', `the machine's speed measured before: ${fmt(x.measured_period_before, 3)} s a period, ${fmt(x.machine_speed, 2)} × the profile's estimate`]] as Array<[string, string]>)),
      ...(x.changed
        ? ([
            ['migration', `estimated ${fmt(x.estimated_migration_seconds, 2)} s; took ${fmt(x.migration_seconds, 2)} s (${fmt(x.seconds, 2)} s from the loss to going on)`],
            ['bytes', `${x.migration_bytes ?? 'n/a'} sent; the least a migration could send: ${x.migration_minimum_bytes ?? 'n/a'}`],
            ['parameters equal after the migration', String(x.parameters_equal_after_migration ?? 'n/a')],
          ] as Array<[string, string]>)
        : ([['decision', `kept the plan: what the devices save over the iterations left (${fmt(x.gain_seconds, 1)} s) does not pay for the move`]] as Array<[string, string]>)),
    ];
    return (
      `<h3>${i + 1}. Iteration ${x.iteration}: ${esc(x.trigger)}${x.lost.length ? `, device(s) ${x.lost.join(', ')} lost` : ''}${x.joined.length ? `, device(s) ${x.joined.join(', ')} joined` : ''}</h3>` +
      `<table>${figures.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join('')}</table>` +
      `<p>Before:</p>${planSvg(rows(x.plan_before), r.devices, r.devicesPerNode, before)}` +
      (x.changed ? `<p>After:</p>${planSvg(rows(x.plan_after), r.devices, r.devicesPerNode, lostBy)}` : '')
    );
  });
  return `<section id="replans" data-items="${replans.length}"><h2>Re-plans</h2><p>Devices lost for good, or joined beyond the plan, and what the run did about them. Shaded columns: devices lost.</p>${parts.join('')}</section>`;
}

/** The whole report for a run. */
export function renderReport(r: ReportInput): string {
  const measuredIteration = r.metrics?.length ? [...r.metrics.map((m) => m.seconds)].sort((a, b) => a - b)[Math.floor(r.metrics.length / 2)] : null;
  return (
    `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${esc(r.title)}</title><style>${STYLE}</style></head><body>` +
    `<h1>${esc(r.title)}</h1>` +
    summarySection(r) +
    planSection(r) +
    measuredSection(r) +
    estimateSection(r, measuredIteration) +
    curvesSection(r) +
    episodesSection(r) +
    replansSection(r) +
    chaosSection(r) +
    `</body></html>\n`
  );
}

/** A plan and its estimated timeline, before any run (npm run plan --html). */
export function renderPlan(r: ReportInput & { caption: string }): string {
  return (
    `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${esc(r.title)}</title><style>${STYLE}</style></head><body>` +
    `<h1>${esc(r.title)}</h1><p>${esc(r.caption)}</p>` +
    planSection(r) +
    estimateSection(r) +
    `</body></html>\n`
  );
}

/** Plan rows in the calls' order. */
export function planRows(plan: Record<CallName, { mesh: string; devices: number[]; dp: number; tp: number; pp: number }>): PlanRow[] {
  return Object.entries(plan).map(([call, p]) => ({ call, ...p }));
}
