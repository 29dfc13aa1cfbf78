import { describe, it, expect } from 'vitest';
import { MeshError, availableDevices, deviceCount, meshAvailable, parseMesh, singleDeviceMesh, type Cluster } from './cluster.ts';

const two8: Cluster = { nodes: 2, devicesPerNode: 8 };

function meshError(text: string, cluster: Cluster = two8): string {
  try {
    parseMesh(text, cluster);
  } catch (e) {
    expect(e).toBeInstanceOf(MeshError);
    expect((e as Error).name).toBe('MeshError');
    return (e as Error).message;
  }
  throw new Error(`parseMesh(${JSON.stringify(text)}) did not throw`);
}

describe('parseMesh: valid forms', () => {
  it('"0:0" is one device', () => {
    expect(parseMesh('0:0', two8)).toEqual({ name: '0:0', devices: [0] });
  });

  it('"0:2-3" is an aligned pair', () => {
    expect(parseMesh('0:2-3', two8)).toEqual({ name: '0:2-3', devices: [2, 3] });
  });

  it('"0:4-7" is an aligned block of four', () => {
    expect(parseMesh('0:4-7', two8)).toEqual({ name: '0:4-7', devices: [4, 5, 6, 7] });
  });

  it('"0-1:*" is two whole nodes, numbered node-major', () => {
    expect(parseMesh('0-1:*', two8).devices).toEqual([...Array(16).keys()]);
  });

  it('devices on node 1 are offset by devicesPerNode (node n, slot d = n·8 + d)', () => {
    expect(parseMesh('1:3', two8).devices).toEqual([11]);
    expect(parseMesh('1:0-7', two8).devices).toEqual([8, 9, 10, 11, 12, 13, 14, 15]);
    expect(parseMesh('1:*', two8).devices).toEqual([8, 9, 10, 11, 12, 13, 14, 15]);
    expect(parseMesh('1-1:*', two8).devices).toEqual([8, 9, 10, 11, 12, 13, 14, 15]);
  });

  it('a one-device range "0:5-5" is a block of one', () => {
    expect(parseMesh('0:5-5', two8).devices).toEqual([5]);
  });

  it('surrounding white space is tolerated', () => {
    expect(parseMesh(' 0:1 ', two8).devices).toEqual([1]);
  });
});

describe('parseMesh: errors', () => {
  it('a misaligned block "0:1-2"', () => {
    expect(meshError('0:1-2')).toBe('mesh "0:1-2": expected an aligned power-of-two block of devices (e.g. 0-1, 2-3, 4-7), got 1-2');
  });

  it('a misaligned block of four "0:2-5"', () => {
    expect(meshError('0:2-5')).toMatch(/aligned power-of-two block.*got 2-5$/);
  });

  it('a block whose size is not a power of two "0:0-2"', () => {
    expect(meshError('0:0-2')).toBe('mesh "0:0-2": expected an aligned power-of-two block of devices (e.g. 0-1, 2-3, 4-7), got 0-2');
  });

  it('a node outside the cluster', () => {
    expect(meshError('2:0')).toBe('mesh "2:0": node 2 is outside the cluster of 2 node(s)');
    expect(meshError('0-2:*')).toBe('mesh "0-2:*": node 2 is outside the cluster of 2 node(s)');
  });

  it('a device outside the node', () => {
    expect(meshError('0:8')).toBe('mesh "0:8": device 8 is outside a node of 8 device(s)');
    expect(meshError('0:0-3', { nodes: 1, devicesPerNode: 2 })).toBe('mesh "0:0-3": device 3 is outside a node of 2 device(s)');
  });

  it('ranges that run backwards', () => {
    expect(meshError('0:3-2')).toBe('mesh "0:3-2": device range 3-2 runs backwards');
    expect(meshError('1-0:*')).toBe('mesh "1-0:*": node range 1-0 runs backwards');
  });

  it('several nodes with a device range', () => {
    expect(meshError('0-1:0-1')).toBe('mesh "0-1:0-1": a mesh of several nodes takes whole nodes ("0-1:*")');
  });

  it.each(['', '0', ':0', '0:', 'a:b', '0:1-', '0:-1', '0:*-1', '0.0', '0:0,1', '-1:0', '0:1.5'])('bad syntax %j', (text) => {
    expect(meshError(text)).toBe(`mesh ${JSON.stringify(text)}: expected "NODE:DEVICE", "NODE:FIRST-LAST" or "FIRSTNODE-LASTNODE:*"`);
  });
});

describe('deviceCount and singleDeviceMesh', () => {
  it('counts nodes × devices per node', () => {
    expect(deviceCount(two8)).toBe(16);
    expect(deviceCount({ nodes: 1, devicesPerNode: 4 })).toBe(4);
  });

  it('names one device as NODE:SLOT, and parses back to that device', () => {
    expect(singleDeviceMesh(0, two8)).toBe('0:0');
    expect(singleDeviceMesh(7, two8)).toBe('0:7');
    expect(singleDeviceMesh(8, two8)).toBe('1:0');
    expect(singleDeviceMesh(13, two8)).toBe('1:5');
    for (let d = 0; d < 16; d++) expect(parseMesh(singleDeviceMesh(d, two8), two8).devices).toEqual([d]);
  });
});

describe('a cluster that has lost devices', () => {
  const holed: Cluster = { nodes: 2, devicesPerNode: 4, lost: [5] };

  it('refuses a mesh that holds a lost device, naming it; takes the others as before', () => {
    expect(() => parseMesh('1:0-1', holed)).toThrow('mesh "1:0-1": holds device 5, which the run has lost');
    expect(() => parseMesh('0-1:*', { ...holed, lost: [5, 2] })).toThrow('mesh "0-1:*": holds devices 2, 5, which the run has lost');
    expect(parseMesh('1:2-3', holed).devices).toEqual([6, 7]);
    expect(parseMesh('0:0-3', holed).devices).toEqual([0, 1, 2, 3]);
  });

  it('says which meshes are still whole and which devices are left', () => {
    expect(['1:0', '1:1', '1:0-1', '1:0-3', '0-1:*', '0:0-3'].map((m) => meshAvailable(m, holed))).toEqual([true, false, false, false, false, true]);
    expect(availableDevices(holed)).toEqual([0, 1, 2, 3, 4, 6, 7]);
    expect(availableDevices({ nodes: 1, devicesPerNode: 2 })).toEqual([0, 1]);
  });
});
