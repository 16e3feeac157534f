/**
 * SGLang router's approximate radix tree (sgl-router `tree.rs`): one character tree shared
 * by all workers, each node remembering which workers ("tenants") were sent text through it
 * and when. It knows what it routed, not what the engines still hold.
 */
class TreeNode {
  readonly children = new Map<number, TreeNode>();
  readonly tenants = new Map<string, number>();

  constructor(public text: string) {}
}

export class ApproximateRadixTree {
  private readonly root = new TreeNode('');
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
        child = new TreeNode(text.slice(offset));
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

  /** The longest prefix of `text` in the tree and the most recent tenant at its end. */
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
    let tenant: string | undefined;
    let latest = -1;
    for (const [name, at] of node.tenants) if (at > latest) [tenant, latest] = [name, at];
    return { matchedChars: offset, tenant };
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
    const middle = new TreeNode(child.text.slice(0, at));
    for (const [tenant, time] of child.tenants) middle.tenants.set(tenant, time);
    child.text = child.text.slice(at);
    middle.children.set(child.text.charCodeAt(0), child);
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
