/**
 * SGLang router's approximate radix tree (sgl-project/sglang
 * `sgl-model-gateway/src/policies/tree.rs` @ 24ce7f6c91a1b0fc65534cedf959e22423920b75): one
 * character tree shared by all workers, each node remembering which workers ("tenants") were
 * sent text through it and when. It knows what it routed, not what the engines still hold.
 * Timestamps are a counter here (SGLang's newer token tree does the same) instead of wall-clock
 * milliseconds.
 */
class TreeNode {
  readonly children = new Map<number, TreeNode>();
  readonly tenants = new Map<string, number>();

  constructor(
    public text: string,
    public parent: TreeNode | undefined,
  ) {}
}

export class ApproximateRadixTree {
  private readonly root = new TreeNode('', undefined);
  private readonly tenantChars = new Map<string, number>();
  private clock = 0;

  /** Records that `text` was sent to `tenant`. */
  insert(text: string, tenant: string): void {
    const now = ++this.clock;
    let node = this.root;
    let offset = 0;
    while (offset < text.length) {
      const first = text.charCodeAt(offset);
      let child = node.children.get(first);
      if (child === undefined) {
        child = new TreeNode(text.slice(offset), node);
        node.children.set(first, child);
        this.touch(child, tenant, now);
        return;
      }
      const shared = sharedLength(child.text, text, offset);
      if (shared < child.text.length) child = this.split(node, child, shared);
      this.touch(child, tenant, now);
      node = child;
      offset += shared;
    }
  }

  /**
   * The longest prefix of `text` in the tree and a tenant at its end: the first in the node's
   * tenant map (SGLang's DashMap order, arbitrary; insertion order here), not the most recent.
   * The lookup counts as an access: the tenant's timestamps are refreshed up to the root.
   */
  prefixMatch(text: string): { matchedChars: number; tenant: string | undefined } {
    let node = this.root;
    let offset = 0;
    while (offset < text.length) {
      const child = node.children.get(text.charCodeAt(offset));
      if (child === undefined) break;
      const shared = sharedLength(child.text, text, offset);
      offset += shared;
      node = child;
      if (shared < child.text.length) break;
    }
    const tenant: string | undefined = node.tenants.keys().next().value;
    if (tenant !== undefined) {
      const now = ++this.clock;
      for (let at: TreeNode | undefined = node; at !== undefined; at = at.parent) if (at.tenants.has(tenant)) at.tenants.set(tenant, now);
    }
    return { matchedChars: offset, tenant };
  }

  /**
   * SGLang's `evict_tenant_by_size`: while a tenant owns more than `maxChars` characters, drop
   * its least recently used leaf (a node it holds that none of its children holds), and prune
   * nodes no tenant holds any more.
   */
  evictTenantBySize(maxChars: number): void {
    const leaves: Array<{ at: number; tenant: string; node: TreeNode }> = [];
    const visit = (node: TreeNode) => {
      for (const child of node.children.values()) visit(child);
      for (const [tenant, at] of node.tenants) {
        let leaf = true;
        for (const child of node.children.values()) if (child.tenants.has(tenant)) leaf = false;
        if (leaf && node !== this.root) leaves.push({ at, tenant, node });
      }
    };
    visit(this.root);
    // A sorted array stands in for SGLang's min-heap; parents that become leaves are inserted in order.
    leaves.sort((a, b) => a.at - b.at);
    while (leaves.length > 0) {
      const { tenant, node } = leaves.shift()!;
      if (this.size(tenant) <= maxChars) continue;
      this.tenantChars.set(tenant, this.size(tenant) - node.text.length);
      node.tenants.delete(tenant);
      const parent = node.parent!;
      if (node.children.size === 0 && node.tenants.size === 0) parent.children.delete(node.text.charCodeAt(0));
      if (parent === this.root || !parent.tenants.has(tenant)) continue;
      let leaf = true;
      for (const child of parent.children.values()) if (child.tenants.has(tenant)) leaf = false;
      if (!leaf) continue;
      const entry = { at: parent.tenants.get(tenant)!, tenant, node: parent };
      let i = 0;
      while (i < leaves.length && leaves[i].at <= entry.at) i++;
      leaves.splice(i, 0, entry);
    }
  }

  /** Characters attributed to a tenant (SGLang picks the smallest on a cache miss). */
  size(tenant: string): number {
    return this.tenantChars.get(tenant) ?? 0;
  }

  private touch(node: TreeNode, tenant: string, now: number): void {
    if (!node.tenants.has(tenant)) this.tenantChars.set(tenant, this.size(tenant) + node.text.length);
    node.tenants.set(tenant, now);
  }

  private split(parent: TreeNode, child: TreeNode, at: number): TreeNode {
    const middle = new TreeNode(child.text.slice(0, at), parent);
    for (const [tenant, time] of child.tenants) middle.tenants.set(tenant, time);
    child.text = child.text.slice(at);
    middle.children.set(child.text.charCodeAt(0), child);
    child.parent = middle;
    parent.children.set(middle.text.charCodeAt(0), middle);
    return middle;
  }
}

function sharedLength(edge: string, text: string, offset: number): number {
  const limit = Math.min(edge.length, text.length - offset);
  let shared = 0;
  while (shared < limit && edge.charCodeAt(shared) === text.charCodeAt(offset + shared)) shared++;
  return shared;
}
