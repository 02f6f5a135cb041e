"""EC2 as a cloud provider (boto3, the optional aws extra): provisioning, prices, discovery."""
