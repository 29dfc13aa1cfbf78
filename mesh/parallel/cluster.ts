// Clusters and device meshes as pure data. A mesh is an aligned power-of-two block of devices
// inside one node ("0:4-7"), or a run of whole consecutive nodes ("0-1:*"), as in ReaLHF; this
// keeps the candidate meshes few. Devices are numbered node-major: node n, slot d is n·perNode + d.

export interface Cluster {
  nodes: number;
  devicesPerNode: number;
  /**
   * Devices the run has lost for good (global indices): no mesh may hold one, so a plan searched
   * on this cluster runs on the devices left. A mesh still names its devices by where they sit.
   */
  lost?: readonly number[];
}

export interface Mesh {
  /** As written, e.g. "0:2-3". */
  name: string;
  /** Global device indices, ascending. */
  devices: number[];
}

export class MeshError extends Error {
  override name = 'MeshError';
}

const isPow2 = (n: number) => n > 0 && (n & (n - 1)) === 0;

/** Parses "N:D", "N:D-E" or "N-M:*" against a cluster; the error says what was expected. */
export function parseMesh(written: string, cluster: Cluster): Mesh {
  const mesh = parseMeshShape(written, cluster);
  const lost = mesh.devices.filter((d) => cluster.lost?.includes(d));
  if (lost.length) throw new MeshError(`mesh "${mesh.name}": holds device${lost.length > 1 ? 's' : ''} ${lost.join(', ')}, which the run has lost`);
  return mesh;
}

/** Whether a mesh holds none of the cluster's lost devices. */
export function meshAvailable(written: string, cluster: Cluster): boolean {
  return !parseMeshShape(written, cluster).devices.some((d) => cluster.lost?.includes(d));
}

/** The devices the cluster still has, ascending. */
export function availableDevices(cluster: Cluster): number[] {
  return Array.from({ length: deviceCount(cluster) }, (_, d) => d).filter((d) => !cluster.lost?.includes(d));
}

function parseMeshShape(written: string, cluster: Cluster): Mesh {
  const text = written.trim();
  const m = /^(\d+)(?:-(\d+))?:(\*|\d+(?:-\d+)?)$/.exec(text);
  if (!m) throw new MeshError(`mesh ${JSON.stringify(text)}: expected "NODE:DEVICE", "NODE:FIRST-LAST" or "FIRSTNODE-LASTNODE:*"`);
  const n0 = Number(m[1]);
  const n1 = m[2] === undefined ? n0 : Number(m[2]);
  if (n1 < n0) throw new MeshError(`mesh "${text}": node range ${n0}-${n1} runs backwards`);
  if (n1 >= cluster.nodes) throw new MeshError(`mesh "${text}": node ${n1} is outside the cluster of ${cluster.nodes} node(s)`);
  const per = cluster.devicesPerNode;
  if (m[3] === '*') {
    const devices = [];
    for (let i = n0 * per; i < (n1 + 1) * per; i++) devices.push(i);
    return { name: text, devices };
  }
  if (n1 !== n0) throw new MeshError(`mesh "${text}": a mesh of several nodes takes whole nodes ("${n0}-${n1}:*")`);
  const [a, b] = m[3]!.split('-').map(Number) as [number, number?];
  const last = b ?? a;
  if (last < a) throw new MeshError(`mesh "${text}": device range ${a}-${last} runs backwards`);
  if (last >= per) throw new MeshError(`mesh "${text}": device ${last} is outside a node of ${per} device(s)`);
  const count = last - a + 1;
  if (!isPow2(count) || a % count !== 0) {
    throw new MeshError(`mesh "${text}": expected an aligned power-of-two block of devices (e.g. 0-1, 2-3, 4-7), got ${a}-${last}`);
  }
  const devices = [];
  for (let d = a; d <= last; d++) devices.push(n0 * per + d);
  return { name: text, devices };
}

export function deviceCount(cluster: Cluster): number {
  return cluster.nodes * cluster.devicesPerNode;
}

/** The mesh name of a single device. */
export function singleDeviceMesh(device: number, cluster: Cluster): string {
  return `${Math.floor(device / cluster.devicesPerNode)}:${device % cluster.devicesPerNode}`;
}
